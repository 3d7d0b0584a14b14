"""A real daemon with hooks traces its runs: a `hook_enqueue` per run a new inbox row gets (after its `inbox_insert`),
none for a redelivery, and a `hook_run` per run marked, naming the reply's derived id and the §4.5.1 answer it got;
every line is valid against spec/schemas/trace and the oracle finds the trace clean (TRC-HOOK-*)."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

from daemon_testkit import FAST

from reference.core import reply_client_message_id
from reference.trace import schema_check
from spark_checks import oracle

SENDER = "cd" * 32


def install(state_dir: Path) -> None:
    folder = state_dir / "hooks"
    folder.mkdir()
    for name, body in (("on-message", 'read -r event\necho \'{"reply": "pong"}\'\n'),
                       ("on-dm", "read -r event\nexit 3\n")):
        script = folder / name
        script.write_text("#!/bin/sh\n" + textwrap.dedent(body))
        script.chmod(0o755)
    (folder / "hooks.toml").write_text("[on-message]\nallow_reply = true\n[on-dm]\n")


def events_of(trace_dir: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(trace_dir.glob("daemon-*.jsonl"))
            for line in path.read_text().splitlines()]


def test_a_daemon_traces_its_hook_runs_and_the_oracle_finds_them_clean(broker, make_daemon, tmp_path: Path):
    trace_dir = tmp_path / "trace"
    daemon = make_daemon(broker.url, FAST + f'[hooks]\nenabled = true\n[trace]\ndir = "{trace_dir}"\n', start=False)
    install(daemon.state_dir)
    daemon.start()
    daemon.wait_connected()
    reply = reply_client_message_id("in-t1", "on-message")
    broker.push(body="ping", client_message_id="in-t1", sender=SENDER)
    broker.wait_for(lambda: broker.sends_of(reply), 20, "the hook's reply")
    broker.push(body="ping", client_message_id="in-t1", sender=SENDER)  # a redelivery: no new row, no run

    def marked() -> list[dict]:
        return [e for e in events_of(trace_dir) if e["kind"] == "hook_run"]

    broker.wait_for(lambda: len(marked()) == 2, 20, "both runs marked")
    time.sleep(1.0)
    events = events_of(trace_dir)
    for event in events:
        schema_check(event)
    enqueued = [e for e in events if e["kind"] == "hook_enqueue"]
    assert sorted(e["hook"] for e in enqueued) == ["on-dm", "on-message"]
    insert = next(e for e in events if e["kind"] == "inbox_insert" and e["inserted"])
    assert all(e["seq"] > insert["seq"] and e["inbox_seq"] == insert["inbox_seq"] for e in enqueued)
    runs = {e["hook"]: e for e in marked()}
    assert runs["on-message"]["to"] == "done" and runs["on-message"]["claims"] == 1
    assert runs["on-message"]["reply_client_message_id"] == reply and runs["on-message"]["http_status"] == 202
    assert runs["on-dm"]["to"] == "failed" and runs["on-dm"]["reply_client_message_id"] is None
    report = oracle.check(sorted(trace_dir.glob("daemon-*.jsonl")))
    assert report.invalid_count == 0
    assert report.violations == [], [v.detail for v in report.violations]
    assert report.events == len(events)
