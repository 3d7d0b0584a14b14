"""Hooks in a real daemon (`meshd up` under gunicorn) linked to a scripted broker: a pushed message runs its hook, the
reply reaches the broker once, a redelivery runs nothing, and a daemon killed -9 mid-hook runs it again after its
restart and still replies once (E-48)."""

from __future__ import annotations

import os
import textwrap
import time

from daemon_testkit import FAST

from reference.core import reply_client_message_id

HOOKS_ON = FAST + "[hooks]\nenabled = true\n"
SENDER = "cd" * 32


def install(state_dir, body: str, settings: str = "allow_reply = true\n") -> None:
    folder = state_dir / "hooks"
    folder.mkdir()
    script = folder / "on-message"
    script.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    script.chmod(0o755)
    (folder / "hooks.toml").write_text("[on-message]\n" + settings)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return open(f"/proc/{pid}/stat").read().split()[2] != "Z"


def test_a_pushed_message_runs_its_hook_and_the_reply_reaches_the_broker_once(broker, make_daemon):
    daemon = make_daemon(broker.url, HOOKS_ON, start=False)
    install(daemon.state_dir, """
        read -r event
        echo '{"reply": "pong"}'
        """)
    daemon.start()
    daemon.wait_connected()
    with daemon.unix() as client:
        assert "hooks" in client.get("/v1/version").json()["ipc_features"]
    reply = reply_client_message_id("in-1", "on-message")
    broker.push(body="ping", client_message_id="in-1", sender=SENDER)
    broker.wait_for(lambda: broker.sends_of(reply), 20, "the hook's reply")
    broker.push(body="ping", client_message_id="in-1", sender=SENDER)  # a redelivery: no new row, no run
    time.sleep(1.5)
    sends = broker.sends_of(reply)
    assert len(sends) == 1
    frame = sends[0].frame
    assert frame.get("reply_to_id", frame.get("replyToId")) is not None
    with daemon.unix() as client:
        metrics = client.get("/v1/metrics").text
    assert 'cm_daemon_hook_invocations_total{hook="on-message",state="done"} 1.0' in metrics


def test_hooks_are_off_by_default(broker, daemon):
    with daemon.unix() as client:
        assert "hooks" not in client.get("/v1/version").json()["ipc_features"]


def test_a_bad_hooks_toml_stops_the_daemon_at_start_with_exit_3(broker, make_daemon):
    daemon = make_daemon(broker.url, HOOKS_ON, start=False)
    install(daemon.state_dir, "", settings="sandbox = \"bubblewrap\"\n")
    daemon.start(wait=False)
    assert daemon.wait_exit(30) == 3


def test_a_daemon_killed_9_mid_hook_runs_it_again_and_replies_once(broker, make_daemon):
    daemon = make_daemon(broker.url, HOOKS_ON, start=False)
    pids, count = daemon.state_dir / "hooks" / "pids", daemon.state_dir / "hooks" / "count"
    install(daemon.state_dir, f"""
        echo $$ >> {pids}
        n=$(cat {count} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {count}
        if [ $n -eq 1 ]; then sleep 300; fi
        echo '{{"reply": "pong"}}'
        """)
    daemon.start()
    daemon.wait_connected()
    broker.push(body="ping", client_message_id="in-9", sender=SENDER)
    deadline = time.monotonic() + 20
    while not pids.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    orphan = int(pids.read_text().split()[0])
    daemon.kill9()
    assert alive(orphan)  # the hook is in a process group of its own: it outlives its daemon
    daemon.start()
    daemon.wait_connected()
    reply = reply_client_message_id("in-9", "on-message")
    broker.wait_for(lambda: broker.sends_of(reply), 30, "the re-run hook's reply")
    time.sleep(1.0)
    assert len(broker.sends_of(reply)) == 1 and count.read_text().strip() == "2"
    assert not alive(orphan)
